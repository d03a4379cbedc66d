"""Notifications (layer 3): alerts from the change feed, Alertmanager-style grouping,
channels (Apprise, signed webhooks), deliveries with retries, and their settings pages."""
