"""Generation: the request and result types (:mod:`.types`) and the native decode engine (:mod:`.engine`)."""
