"""The parts of one step: feeding, losses, overflow check and handling, the decision, unscaling, streaks; may import core, diagnosis, scale."""
