"""A blocking call returns the value on every supported Python, on the real
servers (issue 53, item 7; the mechanism's tests are tests/core/test_blocking_results.py)."""

from __future__ import annotations

from typing import Any

import loopbridge as lb


def test_the_asyncpg_recipe_gives_values(pg: Any) -> None:
    from recipes.recipe import load_recipe

    recipe = load_recipe("asyncpg")
    assert not hasattr(recipe, "value")  # no helper for what the Python version does
    with lb.LoopThread() as owner:
        pool = recipe.open_pool(owner, pg.dsn, min_size=1, max_size=2)
        try:
            assert recipe.double(pool, 21) == 42
            with lb.blocking(pool).acquire() as conn:
                value = lb.blocking(conn).fetchval("SELECT $1::int + 1", 1)
                assert type(value) is int and value == 2
        finally:
            recipe.close_pool(pool)


def test_the_redis_recipe_gives_replies(redis_server: Any) -> None:
    from recipes.recipe import load_recipe

    recipe = load_recipe("redis")
    with lb.LoopThread() as owner:
        client = recipe.open_client(owner, redis_server.url)
        try:
            lb.blocking(client).delete("blocking-results")
            assert lb.blocking(client).incr("blocking-results") == 1
            assert recipe.count_hit(client, "blocking-results") == [3, 4]
        finally:
            recipe.close_client(client)
