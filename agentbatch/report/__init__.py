"""The HTML report of a run (README, "Report"; docs/report.md): its figures, a trajectory browser, and runs side by
side. One self-contained file that opens from disk (run_dir/paths.py names it: report.html, compare.html):
build.write_report writes it, from_flags is its command line."""
