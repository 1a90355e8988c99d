"""The worker's side of sessions into the runs it holds (``runplane exec``, ``shell``,
``port-forward``): ``host`` takes them and runs each, ``exec`` a command in the run's container,
``ports`` connections to a port inside it (``netns``), ``procs`` what a session started there,
``link`` the connection to the relay where the client meets it."""
