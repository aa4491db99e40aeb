"""The runtime each DDPJob rank runs inside the trainer image."""
