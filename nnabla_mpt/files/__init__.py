"""Files that last: the checkpoint format, archive reading, atomic writes; may import core."""
