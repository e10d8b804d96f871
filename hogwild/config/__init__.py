"""Typed config: dataclass schemas (the one home of every default), field checks, a composed config validated."""
