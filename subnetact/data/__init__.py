"""Package data: the embedded digits supernet (see :mod:`subnetact.digits`)."""
