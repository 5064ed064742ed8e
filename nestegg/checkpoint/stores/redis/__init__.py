"""The Redis store; redis-py is imported only in this package.

``store`` (the store), ``connection`` (the client, the connection kept between scripts,
packed pipelines and retries), ``run_index`` (listing runs), ``layout`` (keys, Lua scripts
and the encoding of records), ``threads`` (the thread tables) and ``errors`` (redis-py's
errors by class).
"""

from nestegg.checkpoint.stores.redis.store import RedisCheckpointStorage, validate_key_prefix

__all__ = ["RedisCheckpointStorage", "validate_key_prefix"]
