"""Applications built on the library, each a ``stream-dp`` command (:mod:`stream_dp.cli`).

* :mod:`stream_dp.apps.demo` -- ``stream-dp demo``: real data through the online learners.
* :mod:`stream_dp.apps.produce` -- ``stream-dp produce``: a bundled dataset into a topic.
* :mod:`stream_dp.apps.watch` -- ``stream-dp watch``: read and score the releases of a topic.
* :mod:`stream_dp.apps.merge` -- ``stream-dp merge``: average a per-partition model's releases.

They use the library and the engine's command-line conventions (:mod:`stream_dp.engine.cli`);
nothing in the library or the engine imports from here (``docs/design.md``, *Layers*).
"""
