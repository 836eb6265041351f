"""Harbor (Terminal-Bench) task directories as a task kind, ``harbor``, run by ``harbor-v1``
(tasks.harbor.env); imported by tasks.harbor.importer."""
