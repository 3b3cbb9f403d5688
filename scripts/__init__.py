"""Machine set-up, the test and demo entry points, and the store seeder (scripts/seed_store.py)."""
