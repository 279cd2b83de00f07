import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
application = get_wsgi_application()

# The test waits for every worker to have loaded the application (a file each) before its
# burst: a worker still importing Django takes no connection, and a burst served by one
# worker proves nothing across processes.
if os.environ.get("READY_DIR"):
    with open(os.path.join(os.environ["READY_DIR"], str(os.getpid())), "w"):
        pass
