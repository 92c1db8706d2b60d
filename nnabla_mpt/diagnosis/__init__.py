"""What went non-finite and where: pass watches, diagnose(), reports; may import core."""
