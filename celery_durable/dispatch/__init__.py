"""The dispatcher: decides due runs, records them in the journal and publishes them."""
