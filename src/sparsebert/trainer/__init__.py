"""The Trainer subclass and the hooks (callbacks, mixins) that attach to it."""
