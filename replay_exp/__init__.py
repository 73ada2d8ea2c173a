"""replay-exp."""
