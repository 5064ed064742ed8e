"""The Redis store; redis-py is imported only in this package.

``store`` (the store) and ``layout`` (keys, Lua scripts and the encoding of records).
"""

from nestegg.checkpoint.stores.redis.store import RedisCheckpointStorage, validate_key_prefix

__all__ = ["RedisCheckpointStorage", "validate_key_prefix"]
