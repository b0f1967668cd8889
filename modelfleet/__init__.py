"""ModelFleet command line (`modelfleet`): server commands and the reference device agent."""
