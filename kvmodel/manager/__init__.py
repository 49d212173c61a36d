"""The manager model by concern: its state (:mod:`.state`), the prefix lookup (:mod:`.lookup`), the
prefix cache (:mod:`.caching`), allocation and freeing (:mod:`.allocation`) and the rules of align-mode
Mamba states (:mod:`.aligned_states`); :class:`kvmodel.manager_model.ManagerModel` composes them."""
