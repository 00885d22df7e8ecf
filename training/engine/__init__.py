"""Studio trainer engine: runs alone inside a compute job; imports no Django."""
