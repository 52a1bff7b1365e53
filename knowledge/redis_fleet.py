"""The Redis knowledge base, part three: clusters and their fleet state.

Keys (named in `knowledge.redis_base` with the others): `<prefix>:clusters` (a hash: name -> the
cluster's JSON), `<prefix>:fleet:<name>` (the cluster's `FleetState` as JSON) and
`<prefix>:orphaned-jobs` (job -> its removed cluster). A fleet step is an optimistic transaction: WATCH the fleet's key,
read it and the cluster, run the step, and write the new state in MULTI/EXEC; a worker raced by
another retries on the state that won. Registering a job on a cluster checks its budget
(`knowledge.fleet_rules.check_fleet`).
"""

from __future__ import annotations

from redis.exceptions import WatchError

from contracts.fleet import ClusterConfig, FleetGrant, FleetState
from contracts.jobs import JobConfig
from knowledge.fleet_rules import UPDATE_RETRIES, FleetStep, check_fleet
from knowledge.redis_base import RedisBase


class RedisFleet(RedisBase):
    async def _cluster(self, name: str) -> ClusterConfig | None:
        raw = await self.redis.hget(self._clusters_key, name)
        return None if raw is None else ClusterConfig.model_validate_json(raw)

    async def _minimums(self, cluster: str) -> dict[str, int]:
        """Each registered job on `cluster`: its minimum parallelism (a scan of the registry: registration
        is rare)."""
        out = {}
        for job in await self.redis.smembers(self._jobs_key):
            config: JobConfig = await self.job_config(job)  # type: ignore[attr-defined]
            if config.cluster == cluster:
                out[job] = config.min_parallelism
        return out

    async def check_job_cluster(self, job_id: str, config: JobConfig) -> None:
        """ConfigError unless the job's cluster is registered and its budget carries every job's minimum."""
        if config.cluster:
            check_fleet(config.cluster, await self._cluster(config.cluster),
                        {**await self._minimums(config.cluster), job_id: config.min_parallelism})

    async def register_cluster(self, cluster: ClusterConfig) -> None:
        jobs = await self._minimums(cluster.name)
        check_fleet(cluster.name, cluster, jobs)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._clusters_key, cluster.name, cluster.model_dump_json())
            if jobs:
                pipe.hdel(self._orphans_key, *jobs)
            await pipe.execute()

    async def remove_cluster(self, name: str) -> None:
        jobs = await self._minimums(name)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self._clusters_key, name)
            pipe.delete(self._fleet_key(name))
            if jobs:
                pipe.hset(self._orphans_key, mapping={job: name for job in jobs})
            await pipe.execute()

    async def orphaned_jobs(self) -> dict[str, str]:
        return dict(await self.redis.hgetall(self._orphans_key))

    async def _unorphan(self, job_id: str) -> None:
        await self.redis.hdel(self._orphans_key, job_id)

    async def clusters(self) -> dict[str, ClusterConfig]:
        return {name: ClusterConfig.model_validate_json(raw)
                for name, raw in (await self.redis.hgetall(self._clusters_key)).items()}

    async def fleet_state(self, name: str) -> FleetState:
        raw = await self.redis.get(self._fleet_key(name))
        return FleetState() if raw is None else FleetState.model_validate_json(raw)

    async def update_fleet(self, name: str, step: FleetStep) -> FleetGrant | None:
        key = self._fleet_key(name)
        for _ in range(UPDATE_RETRIES):
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key, self._clusters_key)
                    raw_cluster = await pipe.hget(self._clusters_key, name)
                    if raw_cluster is None:
                        return None
                    raw = await pipe.get(key)
                    state = FleetState() if raw is None else FleetState.model_validate_json(raw)
                    stored, granted = step(state, ClusterConfig.model_validate_json(raw_cluster).budget)
                    pipe.multi()
                    pipe.set(key, stored.model_dump_json())
                    await pipe.execute()
                    return granted
                except WatchError:
                    continue
        raise RuntimeError(f"the fleet state of cluster {name!r} changed under {UPDATE_RETRIES} attempts in a row")

    async def forget_bid(self, job_id: str) -> None:
        """Drop an unregistered job's bid and held slots from every cluster's fleet."""
        for name in await self.redis.hkeys(self._clusters_key):
            await self.update_fleet(name, lambda state, _budget: (state.without(job_id), _NO_GRANT))


_NO_GRANT = FleetGrant(cluster="", budget=0, granted=0, allocated=0, binds=False)
