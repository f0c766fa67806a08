"""Protocol buffers of the analytics API (generated code lives beside each `.proto`)."""
