"""The Nexmark event generator: proportions, fields, ids, determinism."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import nexmark as nx
from pipeline.loadgen import record_maker

PERSON_FIELDS = {"id", "name", "emailAddress", "creditCard", "city", "state", "dateTime", "extra"}
AUCTION_FIELDS = {"id", "itemName", "description", "initialBid", "reserve", "dateTime", "expires", "seller",
                  "category", "extra"}
BID_FIELDS = {"auction", "bidder", "price", "channel", "url", "dateTime", "extra"}


def test_standard_proportions_are_1_3_46_in_every_epoch() -> None:
    kinds = [nx.event_type(i) for i in range(50)]
    assert kinds == [nx.PERSON] + [nx.AUCTION] * 3 + [nx.BID] * 46
    counts = Counter(nx.event_type(i) for i in range(5000))
    assert counts == {nx.PERSON: 100, nx.AUCTION: 300, nx.BID: 4600}


def test_each_type_has_the_benchmarks_fields() -> None:
    events = [nx.event(i, 1_700_000_000.5 + i) for i in range(50)]
    for e in events:
        assert set(e) == {"id", "type", "ts", e["type"]}
        assert e[e["type"]]["dateTime"] == int(e["ts"] * 1000), "event time is the generation time"
    assert set(events[0]["person"]) == PERSON_FIELDS
    assert set(events[1]["auction"]) == AUCTION_FIELDS
    assert set(events[4]["bid"]) == BID_FIELDS


def test_ids_count_up_in_creation_order() -> None:
    people = [nx.event(i, 0.0)["person"]["id"] for i in range(0, 500, 50)]
    assert people == list(range(1000, 1010))
    auctions = [nx.event(i, 0.0)["auction"]["id"] for i in range(500) if nx.event_type(i) == nx.AUCTION]
    assert auctions == list(range(1000, 1030))


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=2**31))
def test_an_event_is_a_function_of_seed_and_id(event_id: int, seed: int) -> None:
    config = nx.NexmarkConfig(seed=seed)
    assert nx.event(event_id, 5.0, config) == nx.event(event_id, 5.0, config)
    assert nx.nexmark_record(event_id, 16, 5.0, config) == nx.nexmark_record(event_id, 16, 5.0, config)


def test_seeds_differ() -> None:
    a = [nx.event(i, 0.0, nx.NexmarkConfig(seed=1)) for i in range(4, 50)]
    b = [nx.event(i, 0.0, nx.NexmarkConfig(seed=2)) for i in range(4, 50)]
    assert a != b


@given(st.integers(min_value=0, max_value=10**7))
def test_references_point_at_people_and_auctions_near_the_newest(event_id: int) -> None:
    e = nx.event(event_id, 0.0)
    config = nx.DEFAULT
    newest_person = config.first_person_id + max(0, nx.people_before(event_id) - 1)
    newest_auction = config.first_auction_id + max(0, nx.auctions_before(event_id) - 1)
    if e["type"] == nx.BID:
        bid = e["bid"]
        assert newest_auction - config.in_flight_auctions - config.hot_batch <= bid["auction"]
        assert bid["auction"] <= newest_auction + config.id_lead
        assert newest_person - config.active_people - config.hot_batch <= bid["bidder"]
        assert bid["bidder"] <= newest_person + config.id_lead
        assert 100 <= bid["price"] <= 100_000_000
    elif e["type"] == nx.AUCTION:
        auction = e["auction"]
        assert auction["reserve"] >= auction["initialBid"] >= 100
        assert 10 <= auction["category"] < 15
        assert auction["expires"] > auction["dateTime"]
        assert auction["seller"] <= newest_person + config.id_lead


def test_bids_are_skewed_towards_hot_auctions_and_bidders() -> None:
    bids = [nx.event(i, 0.0)["bid"] for i in range(50_000) if nx.event_type(i) == nx.BID]
    by_auction = Counter(b["auction"] for b in bids)
    hot = sum(n for a, n in by_auction.items() if (a - 1000) % 100 == 0)
    assert 0.45 < hot / len(bids) < 0.6  # 1 - 1/2 hot, plus random draws landing on those ids
    hot_bidders = sum(1 for b in bids if (b["bidder"] - 1000) % 100 == 1)
    assert 0.7 < hot_bidders / len(bids) < 0.8  # 1 - 1/4


def test_records_are_json_keyed_by_entity() -> None:
    maker = record_maker("nexmark:7")
    key, value = maker(4, 16, 12.5)
    record = json.loads(value)
    assert record["id"] == 4 and record["type"] == nx.BID and record["ts"] == 12.5
    assert key == f"a{record['bid']['auction']}".encode()
    assert nx.event_key(nx.event(0, 0.0)) == "p1000"


def test_bad_configuration_and_ids_are_refused() -> None:
    with pytest.raises(ValueError):
        nx.NexmarkConfig(bid_proportion=0)
    with pytest.raises(ValueError):
        nx.event(-1, 0.0)
