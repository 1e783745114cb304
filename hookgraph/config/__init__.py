"""Configuration glue between Hydra/OmegaConf and the engine.

Only this package and ``hookgraph.cli`` import OmegaConf. Modules: schema (the structured
configs Hydra validates against), settings (the door: the composed config as frozen, typed
settings), specs (spec files and DictConfig specs as plain bodies for the engine), probe (the
probe command's schema), resolvers (the OmegaConf resolvers the packaged config uses), plain
(OmegaConf containers to plain values), instantiate (``_target_`` with errors under config keys), hooksets
(packaged hook sets stay tolerant only while used as packaged).
"""
