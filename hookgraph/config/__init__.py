"""Configuration glue between Hydra/OmegaConf and the engine.

Modules: schema (the structured configs Hydra validates against), resolvers (the OmegaConf
resolvers the packaged config uses), plain (OmegaConf containers to plain values at the
builders' boundary), instantiate (``_target_`` with errors under config keys), hooksets
(packaged hook sets stay tolerant only while used as packaged).
"""
