"""Adapters to the engines users already run at scale (DESIGN.md: `integrations` may import
anything; nothing imports it but `cli`)."""
