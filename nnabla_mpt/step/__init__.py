"""The parts of one step: feeding, losses, overflow check, unscaling, streaks; may import core, diagnosis, scale."""
