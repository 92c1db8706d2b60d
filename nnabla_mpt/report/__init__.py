"""A run in a picture: the monitor's series read back, the run's summary, the figure, the command; may import core, files."""
