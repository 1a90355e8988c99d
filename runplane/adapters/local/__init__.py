"""The stores of a stack on one machine: one SQLite database and a directory of objects."""
