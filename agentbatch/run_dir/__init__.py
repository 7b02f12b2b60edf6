"""The run directory `data/<run_name>/` (README, "Output"), and the one owner of its files.

paths.py names every file; lines.py is the one reader of its JSONL files; atomic.py the one atomic writer;
lock.py the session's lock and the exports' lock; files.py the appends; answers.py what the lines answer
(the resume scan, the prompts' last word); merge.py trajectories.jsonl; recorder.py what a session writes.
"""
