"""Recipe rendering and the training runtime (torch is imported only when training runs)."""
