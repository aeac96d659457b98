"""Studies: grids of training runs that answer one question each, with a table and a figure."""
