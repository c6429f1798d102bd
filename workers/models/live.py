"""The light tier's learned model, hot-swapped: the version Redis's live pointer names, replaced between batches.

`tierflow learn` (pipeline/agents/trainer.py) promotes and rolls back light model versions by moving a pointer
in Redis (pipeline/adapters/model_store.py). Each light worker watches it (pub/sub, and a poll for a missed
message), loads the named version's weights off the hot path in this thread, and swaps the reference: a batch
reads the reference once, so it is answered by one model from start to end, and nothing is restarted, dropped
or answered twice. A version that cannot be loaded, or whose labels differ from the pack's (its answers are
looked up by label), is refused with an error in the log and the worker keeps the model it has.

Answers name the version (`charngram-ecommerce@light-20261202-...`): the trainer attributes live outcomes to it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from collections.abc import Sequence

import redis

from pipeline.adapters.model_store import PACKAGED, ModelStore
from pipeline.adapters.periodic import Periodic
from pipeline.adapters.redis_client import make_redis
from pipeline.contracts.keys import Keys
from pipeline.settings import Settings
from workers.model import Item, Prediction
from workers.models.charngram import CharNgramClassifier

log = logging.getLogger(__name__)


class LiveLightModel:
    """The packaged char n-gram model until a learned version is live; then that version."""

    def __init__(self, packaged: CharNgramClassifier, settings: Settings, poll_s: float = 2.0) -> None:
        self.packaged = packaged
        self.current: CharNgramClassifier = packaged
        self.name = packaged.name  # the served version's, updated with each swap
        self.version = PACKAGED
        self.settings, self.poll_s = settings, poll_s
        self.swaps = 0
        self._refused: set[str] = set()
        self._warned = -30.0
        self._store: ModelStore | None = None
        self._pubsub: redis.client.PubSub | None = None
        self._watch: Periodic | None = None

    def setup(self, device: str) -> None:
        """Warm the packaged model, serve the live version from the first batch (a restarted worker must not answer
        with a model that was replaced), then watch the pointer."""
        self.packaged.setup(device)
        try:
            self.refresh()
        except (redis.RedisError, OSError) as e:
            log.warning("light model: Redis unavailable (%s); serving %s until it answers", e, self.version)
        self._watch = Periodic("light-model-watch", 0.0, self._wait_for_change, on_exit=self._unsubscribe).start()

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        return self.current.predict(batch)  # one read of the reference: a whole batch on one model

    def refresh(self) -> bool:
        """Load the version the pointer names when it is not the one served; True when the model changed."""
        if self._store is None:
            self._store = ModelStore(make_redis(self.settings), self.settings.redis.prefix)
        wanted = self._store.live()
        if wanted == self.version or wanted in self._refused:
            return False
        if wanted == PACKAGED:
            model = self.packaged
        else:
            try:
                model = self._load(self._store, wanted)
            except Exception as e:  # noqa: BLE001 - a bad version must not stop the worker, nor be retried
                self._refused.add(wanted)
                log.error("light model %s refused (%s); still serving %s", wanted, e, self.current.name)
                return False
        self.current, self.version, self.name = model, wanted, model.name
        self.swaps += 1
        log.info("light model: now serving %s", model.name)
        return True

    def _load(self, store: ModelStore, version: str) -> CharNgramClassifier:
        labels = store.manifest(version).get("labels")
        if labels is not None and list(labels) != self.packaged.labels:
            raise ValueError("its labels differ from the pack's")
        loaded = CharNgramClassifier.load(io.BytesIO(store.weights(version)), self.packaged.labels)
        loaded.answers = self.packaged.answers
        loaded.name = f"{self.packaged.name}@{version}"
        loaded.setup("cpu")
        return loaded

    def _wait_for_change(self) -> None:
        """Block for a change message (or `poll_s`), then check the pointer: a missed message costs one poll.

        Redis down: the model served stays, a one-line warning every 30 s, and the watch resumes when it answers."""
        try:
            if self._pubsub is None:
                self._pubsub = make_redis(self.settings).pubsub(ignore_subscribe_messages=True)
                self._pubsub.subscribe(Keys(self.settings.redis.prefix).model_changed)
            self._pubsub.get_message(timeout=self.poll_s)
            self.refresh()
        except (redis.RedisError, OSError) as e:
            self._unsubscribe()
            if time.monotonic() - self._warned >= 30.0:
                self._warned = time.monotonic()
                log.warning("light model: Redis unavailable (%s); still serving %s", e, self.current.name)
            if self._watch is not None:
                self._watch.stopping.wait(self.poll_s)

    def _unsubscribe(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                self._pubsub.close()
            self._pubsub = None

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
