"""Experiments: each one file (a typed config, its cells, the cell function, its outcomes, comparisons and views),
all run by one entry (``base.main``) that writes one set of files (``base.write_report``). The runner, the
seeds, the folder, the statistics, the output files and the figures belong here and below (``utils``), never to
one experiment."""
