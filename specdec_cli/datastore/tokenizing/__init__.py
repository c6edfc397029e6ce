"""datastore/tokenizing"""
