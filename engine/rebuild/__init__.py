"""Rebuilding a generation's weights from a ledger ref or a seed file: one resolver
(`sources`), one builder (`rebuilding`), the memory check and the output formats."""
