"""The worker side: the actor mixin every worker runs and the session its training thread
reports through."""
