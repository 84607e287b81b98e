"""A small Dramatiq project with periodic actors and no scheduler process."""
