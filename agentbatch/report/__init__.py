"""The HTML report of a run (README, "Report"; docs/report.md): its figures, a trajectory browser, and runs side by
side. One self-contained file that opens from disk: build.write_report writes it, from_flags is its command line."""

REPORT_FILE = "report.html"
COMPARE_FILE = "compare.html"
