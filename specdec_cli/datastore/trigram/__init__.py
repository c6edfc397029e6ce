"""datastore/trigram"""
