"""Imports the built-in tools, which registers them (the tool registry loads this module the
first time it is read). A new built-in tool is one file in `tirl/tools/` and one name here."""

from tirl.tools import python, shell  # noqa: F401
