"""Imports the built-in tools, which registers them (`tirl.tools.toolset`, the code that reads
the registry, imports this module). A new built-in tool is one file in `tirl/tools/`, importing
`tirl.tools.base` (never the `tirl.tools` package, which imports this module), and one name
here."""

from tirl.tools import python, shell  # noqa: F401
