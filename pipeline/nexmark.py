"""Nexmark events: the Person, Auction and Bid records of the Nexmark benchmark's online auction, generated
here from its public specification.

Events come in epochs of 50: in each, 1 person, then 3 auctions, then 46 bids (the benchmark's standard
proportions). An event is a pure function of (seed, event id) and its event time: the same pair gives the
same event in any process. Person ids and auction ids count up from 1000 in the order they are created;
an auction's seller and a bid's bidder and auction are drawn among recent people and auctions, most of
them "hot" (the benchmark's skew, so that windowed queries find matches).

A record is JSON
    {"id": <event id>, "type": "person" | "auction" | "bid", "ts": <event time, epoch s>, "<type>": {...}}
with the fields of its type:
    person:  id, name, emailAddress, creditCard, city, state, dateTime, extra
    auction: id, itemName, description, initialBid, reserve, dateTime, expires, seller, category, extra
    bid:     auction, bidder, price, channel, url, dateTime, extra
Prices are in cents; dateTime and expires are epoch milliseconds (dateTime is the event time).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

PERSON, AUCTION, BID = "person", "auction", "bid"

_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle",
           "Kent", "Cheyenne")
_FIRST = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
_LAST = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class NexmarkConfig:
    """The generator's parameters; the defaults are the benchmark's.

    hot_*_ratio h: a draw is "hot" with probability 1 - 1/h. A hot seller or bidder is the newest person
    whose id is a multiple of `hot_batch` (bidders: that id + 1, so they differ from sellers); a hot
    auction the newest auction whose id is a multiple of `hot_batch`. Otherwise a seller or bidder is one
    of the `active_people` newest people (or up to `id_lead` not yet created), an auction one of the
    `in_flight_auctions` newest (or up to `id_lead` ahead)."""

    seed: int = 0
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    first_person_id: int = 1000
    first_auction_id: int = 1000
    first_category_id: int = 10
    categories: int = 5
    active_people: int = 1000
    in_flight_auctions: int = 100
    id_lead: int = 10
    hot_batch: int = 100
    hot_auction_ratio: int = 2
    hot_seller_ratio: int = 4
    hot_bidder_ratio: int = 4
    auction_length_s: float = 10.0  # an auction's mean length (its expiry is dateTime + U(1 ms, 2 x this))
    extra_bytes: int = 0  # the `extra` filler per event (the benchmark pads events to ~100-500 bytes)

    def __post_init__(self) -> None:
        if min(self.person_proportion, self.auction_proportion, self.bid_proportion) < 1:
            raise ValueError("every proportion must be at least 1")
        if min(self.hot_auction_ratio, self.hot_seller_ratio, self.hot_bidder_ratio, self.hot_batch) < 1:
            raise ValueError("hot ratios and the hot batch must be at least 1")

    @property
    def epoch(self) -> int:
        """Events per epoch (50 with the standard proportions)."""
        return self.person_proportion + self.auction_proportion + self.bid_proportion


DEFAULT = NexmarkConfig()


def event_type(event_id: int, config: NexmarkConfig = DEFAULT) -> str:
    """Whether event `event_id` is a person, an auction or a bid."""
    offset = event_id % config.epoch
    if offset < config.person_proportion:
        return PERSON
    if offset < config.person_proportion + config.auction_proportion:
        return AUCTION
    return BID


def people_before(event_id: int, config: NexmarkConfig = DEFAULT) -> int:
    """People created by events 0 .. event_id - 1."""
    epochs, offset = divmod(event_id, config.epoch)
    return epochs * config.person_proportion + min(offset, config.person_proportion)


def auctions_before(event_id: int, config: NexmarkConfig = DEFAULT) -> int:
    """Auctions created by events 0 .. event_id - 1."""
    epochs, offset = divmod(event_id, config.epoch)
    in_epoch = min(max(0, offset - config.person_proportion), config.auction_proportion)
    return epochs * config.auction_proportion + in_epoch


def _rng(event_id: int, config: NexmarkConfig) -> random.Random:
    # An int seed is used as is (no salted hashing), so every process draws the same numbers.
    return random.Random((config.seed << 40) ^ event_id)


def _price(rng: random.Random) -> int:
    """Cents, log-uniform from $1 to $1,000,000."""
    return round(10.0 ** (rng.random() * 6.0) * 100.0)


def _word(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(_LETTERS) for _ in range(length))


def _person_ref(event_id: int, rng: random.Random, hot_ratio: int, hot_offset: int, config: NexmarkConfig) -> int:
    """A seller (hot_offset 0) or bidder (1) id for event `event_id`."""
    newest = max(0, people_before(event_id, config) - 1)  # base-0 id of the newest person
    if rng.randrange(hot_ratio) > 0:
        base0 = (newest // config.hot_batch) * config.hot_batch + hot_offset
    else:
        known = newest + 1
        active = min(known, config.active_people)
        base0 = known - active + rng.randrange(active + config.id_lead)
    return base0 + config.first_person_id


def _auction_ref(event_id: int, rng: random.Random, config: NexmarkConfig) -> int:
    newest = max(0, auctions_before(event_id, config) - 1)
    if rng.randrange(config.hot_auction_ratio) > 0:
        base0 = (newest // config.hot_batch) * config.hot_batch
    else:
        low = max(0, newest - config.in_flight_auctions)
        base0 = low + rng.randrange(newest - low + 1 + config.id_lead)
    return base0 + config.first_auction_id


def _extra(rng: random.Random, config: NexmarkConfig) -> str:
    return _word(rng, config.extra_bytes) if config.extra_bytes > 0 else ""


def person(event_id: int, ts: float, config: NexmarkConfig = DEFAULT) -> dict[str, Any]:
    rng = _rng(event_id, config)
    card = " ".join(f"{rng.randrange(10_000):04d}" for _ in range(4))
    return {
        "id": people_before(event_id, config) + config.first_person_id,
        "name": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
        "emailAddress": f"{_word(rng, 7)}@{_word(rng, 5)}.com",
        "creditCard": card,
        "city": rng.choice(_CITIES),
        "state": rng.choice(_STATES),
        "dateTime": int(ts * 1000),
        "extra": _extra(rng, config),
    }


def auction(event_id: int, ts: float, config: NexmarkConfig = DEFAULT) -> dict[str, Any]:
    rng = _rng(event_id, config)
    initial = _price(rng)
    millis = int(ts * 1000)
    return {
        "id": auctions_before(event_id, config) + config.first_auction_id,
        "itemName": _word(rng, 20),
        "description": _word(rng, 100),
        "initialBid": initial,
        "reserve": initial + _price(rng),
        "dateTime": millis,
        "expires": millis + 1 + rng.randrange(max(1, int(2000 * config.auction_length_s))),
        "seller": _person_ref(event_id, rng, config.hot_seller_ratio, 0, config),
        "category": config.first_category_id + rng.randrange(config.categories),
        "extra": _extra(rng, config),
    }


def bid(event_id: int, ts: float, config: NexmarkConfig = DEFAULT) -> dict[str, Any]:
    rng = _rng(event_id, config)
    auction_id = _auction_ref(event_id, rng, config)
    channel = rng.choice(_CHANNELS)
    return {
        "auction": auction_id,
        "bidder": _person_ref(event_id, rng, config.hot_bidder_ratio, 1, config),
        "price": _price(rng),
        "channel": channel,
        "url": f"https://www.nexmark.com/{_word(rng, 5)}/item.htm?query=1&channel_id={auction_id % 1000}",
        "dateTime": int(ts * 1000),
        "extra": _extra(rng, config),
    }


_MAKERS = {PERSON: person, AUCTION: auction, BID: bid}


def event(event_id: int, ts: float, config: NexmarkConfig = DEFAULT) -> dict[str, Any]:
    """Event `event_id` at event time `ts` (epoch seconds) as its JSON object."""
    if event_id < 0:
        raise ValueError(f"event ids start at 0, not {event_id}")
    kind = event_type(event_id, config)
    return {"id": event_id, "type": kind, "ts": ts, kind: _MAKERS[kind](event_id, ts, config)}


def event_key(record: dict[str, Any]) -> str:
    """The Kafka key of an event: the entity it is about (a bid's auction, an auction's seller, a person)."""
    body = record[record["type"]]
    if record["type"] == BID:
        return f"a{body['auction']}"
    if record["type"] == AUCTION:
        return f"p{body['seller']}"
    return f"p{body['id']}"


def nexmark_record(event_id: int, _keys: int, now: float, config: NexmarkConfig = DEFAULT) -> tuple[bytes, bytes]:
    """A load generator record maker (pipeline.loadgen.RecordMaker): event `event_id` at event time `now`."""
    record = event(event_id, now, config)
    return event_key(record).encode(), json.dumps(record, separators=(",", ":")).encode()
