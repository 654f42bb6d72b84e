"""Application and OS check plugins (entry-point group ``hafo.checks``)."""
