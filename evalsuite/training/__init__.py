"""Training: one loop for MQAR cells and small LMs (:mod:`.train`, :mod:`.train_step`), the LM corpus runs
(:mod:`.lm_train`) and the worker pool that trains sweep cells (:mod:`.pool`)."""
