"""Applications built on the library: ``stream-dp demo`` (:mod:`stream_dp.apps.demo`).

Nothing in the library imports from here (``docs/design.md``, *Layers*).
"""
