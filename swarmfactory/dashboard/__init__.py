"""The live dashboard: ``swarmfactory dashboard`` serves a read-only view of an evidence store.

``queries`` holds the SQL (bounded: GROUP BY and pages), ``pages`` the HTML, ``server`` the HTTP
server; the charts are the report's (``report/charts.py``).
"""

from __future__ import annotations


def serve(store, host: str = "127.0.0.1", port: int = 8050, on_ready=None, verbose: bool = False) -> None:
    """Serve ``store`` (a ``Store`` this server owns: its connections become read-only) until
    Ctrl-C. ``on_ready(url)`` is called once the socket listens."""
    from swarmfactory.dashboard.server import DashboardServer

    server = DashboardServer(store, host, port, verbose=verbose)
    try:
        if on_ready:
            on_ready(server.url)
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        store.close()
