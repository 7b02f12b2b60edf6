"""Per-sample sandboxes: where a sample's commands run and its files live (docs/sandboxes.md).

base.py       the interfaces: Sandbox (what a tool gets), Process, Backend (what a kind of sandbox implements)
registry.py   the backends by name (`@registry.backend("name")`)
choice.py     which backend each sample gets, decided once per session
sample.py     one sample's sandbox from its first use to its end
"""
