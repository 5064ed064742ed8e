"""Clean-up of what a test left on the test servers, under its own prefix."""

from __future__ import annotations


async def drop_postgres_tables(url: str, prefix: str) -> None:
    """Drop every table and function whose name starts with ``prefix`` (what ``drop()`` left)."""
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables"
            " WHERE left(table_name, %s) = %s",
            (len(prefix), prefix),
        )
        for schema, table in await cursor.fetchall():
            await conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(schema, table))
            )
        cursor = await conn.execute(
            "SELECT oid::regprocedure::text FROM pg_proc WHERE left(proname, %s) = %s",
            (len(prefix), prefix),
        )
        for (function,) in await cursor.fetchall():
            await conn.execute(
                sql.SQL("DROP FUNCTION IF EXISTS {} CASCADE").format(sql.SQL(function))
            )


async def delete_redis_keys(url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (whatever ``drop()`` left)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await client.unlink(*keys)
    finally:
        await client.aclose()
