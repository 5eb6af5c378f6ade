"""The call pipeline: one request in, one reply out (arguments, run, ledger, cancels)."""
