"""Model updates across a fleet: registry, signing, store, download and rollout documents.

A floor beside `detection/`: it may import `configkit` and `detection` (model metadata), never
the agent, the cloud service, the testbed or the benches. The agent side lives in
`edge_agent/fleet/`; the operator's command is `fleet` (`fleet.cli`). See docs/fleet.md.
"""
