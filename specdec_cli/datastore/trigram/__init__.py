"""ADED's tri-gram datastores: the stored top-k rows (``store``) and the adaptive matrix drafts read (``matrix``)."""
