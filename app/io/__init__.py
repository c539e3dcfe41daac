"""The one I/O layer under every front end (HTTP range I/O, NBD; a request the cluster
relays reaches it on the owner node).

It owns the neutral op type (``Io``), the one way into a volume (``execute``, and
``start_inline`` for a batch an event loop may start itself), the admission every
front end counts against (``VolumeAdmission``), the executor that runs batches off
the event loop (``IoExecutor``) and the error vocabulary each front end maps once
(``IoStatus``). The partial-block rule is the volume's (``app.dm.datapath``): a
batch of any alignment goes in as it is.

Imports ``dm``, ``errors`` and ``vocab``; never a front end (``api``,
``nbd``), never HTTP or SQL.
"""
