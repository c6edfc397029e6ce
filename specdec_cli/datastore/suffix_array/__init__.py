"""datastore/suffix_array"""
