"""Entry point of a rank process: ``python -m nsa_cp_comm._worker RANK WORLD BACKEND DEVICE STORE FD THREADS``.

A fresh interpreter rather than multiprocessing's spawn, which would re-import
the parent's ``__main__`` (a Hydra app, a test runner) in every rank."""

import sys

from nsa_cp_comm.ranks import worker_main

if __name__ == "__main__":
    rank, world, backend, device, store, fd, threads = sys.argv[1:8]
    worker_main(int(rank), int(world), backend, device, store, int(fd), int(threads))
