"""`tirl openenv-serve`: a task source as an OpenEnv environment
(`tirl.integrations.openenv.server`, which holds its arguments and its command)."""

from __future__ import annotations

from tirl.integrations.openenv import server as openenv_server


def add_parser(sub) -> None:
    p = sub.add_parser(
        "openenv-serve",
        help="serve a task source as an OpenEnv environment (pip install 'tirl[openenv]')",
        description=openenv_server.__doc__.split("\n\n")[0],
    )
    openenv_server.add_arguments(p)
    p.set_defaults(func=openenv_server.run, config=None, overrides=[])
