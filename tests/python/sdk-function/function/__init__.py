"""A Crossplane composition function written with crossplane-function-sdk-python."""
