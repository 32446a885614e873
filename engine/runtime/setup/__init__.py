"""What a session settles before its loop runs: each entry's plan (`plans`: train, resume
and fork as data), the guards around setup (`guards`: the lease, signals, a fork's
rollback), the refusals taken before a run exists (`preflight`, `devices`, `forkcheck`,
`stored_code` without --trust-code), the inputs fingerprinted and compared (`inputs`),
members per forward (`batching`), and a new ledger removed again on failure (`fresh_ledger`).
"""
